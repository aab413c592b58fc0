"""Watchdogs of a forge process's own event loop: awake.py leaves the time the process was stopped
out of every wait on a peer; loopwatch.py answers signals and names a blocked loop whatever a
function does."""
