from fednorm.cli import run

run()
