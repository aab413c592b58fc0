"""`forge top`: a live terminal view of a node's cards, read from its control endpoint's /v1/stats.

poll.py reads the node (bounded HTTP), view.py turns two snapshots into a rich renderable (pure),
live.py paces the polls and draws the frames."""
