import sys

from sessiongate.benchmarks.replay import main

sys.exit(main(sys.argv[1:]))
