# Experiment: the step timer (../steptime, STEPLOG=DIR) and every thread's CPU time (../../../cpu-proxy/exp/threadcpu,
# THREADLOG=DIR) together, in every process, each in its own namespace (both name their folder _DIR).
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(_HERE, "..", "steptime", "sitecustomize.py"),
              os.path.join(_HERE, "..", "..", "..", "cpu-proxy", "exp", "threadcpu", "sitecustomize.py")):
    exec(compile(open(_path).read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})  # own globals
