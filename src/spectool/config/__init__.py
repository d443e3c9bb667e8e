"""Every command's settings, a module each: the settings groups (settings/) it takes and what it alone sets; the
command line is generated from them (cli.py)."""
