"""``python -m healer_dev demo|bench|devstack``: the development command line
(:mod:`healer_dev.cli`)."""

import sys

from healer_dev.cli import main

sys.exit(main())
