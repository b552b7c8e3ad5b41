"""The PPF benchmarks' former entry point: they live in :mod:`fednorm.bench` now.

    .venv/bin/python bench/bench_ppf.py ARGS    # the same as: fednorm bench ARGS

See bench/README.md for the sections and options.
"""

import sys

from fednorm.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
