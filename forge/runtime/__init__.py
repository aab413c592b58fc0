"""The node's runtime. Per card, an admission-controlled runtime (admission.py) drives its engine from one
thread (driver.py), keeps the in-flight table (flights.py), watches progress (progress.py) and hands every
request out exactly once (outcomes.py); options.py is what a caller attaches to a request. node.py and
server.py tie the cards, the broker and the control endpoint together."""
