import sys

from ringtop.agent.watcher.process import main

sys.exit(main())
