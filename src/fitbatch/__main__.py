from fitbatch.cli import main
import sys

sys.exit(main())
