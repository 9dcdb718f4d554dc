"""``python -m lengthgen_utils``: the command line (:mod:`lengthgen_utils.tools.cli`)."""
import sys

from .tools.cli import main

sys.exit(main())
