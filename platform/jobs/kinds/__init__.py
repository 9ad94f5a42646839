"""Built-in job kinds; each module registers one kind when imported (see jobs/apps.py)."""
