"""`python -m forge.host FD`: a card worker process (forge/host/worker.py); its node starts it."""
import sys

from forge.host.worker import main

main(int(sys.argv[1]))
