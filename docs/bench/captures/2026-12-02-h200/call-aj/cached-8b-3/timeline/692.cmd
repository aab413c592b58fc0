/opt/torch/.venv/bin/python3 -B -m forge.host 51 
