import sys

from ringtop.cli.main import main

sys.exit(main())
