import sys

from fednorm.cli import main

sys.exit(main())
