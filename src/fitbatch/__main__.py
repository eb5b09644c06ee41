import sys

from fitbatch.cli import main

sys.exit(main())
