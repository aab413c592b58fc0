# Experiment: the step timer (../steptime) and the quiet driver (../quiet-driver) together, in every process.
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
for _name in ("steptime", "quiet-driver"):
    _path = os.path.join(_HERE, "..", _name, "sitecustomize.py")
    exec(compile(open(_path).read(), _path, "exec"))
