"""forge.host FD: a card worker process (forge/host/worker.py); its node starts it
(forge/link/worker_argv.py)."""
import sys

from forge.host.worker import main

main(int(sys.argv[1]))
