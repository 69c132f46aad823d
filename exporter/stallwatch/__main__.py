import sys

from stallwatch.cli import main

sys.exit(main())
