"""Builders of dpsql's distributions besides the Python wheel and sdist (``make dist``, ``make
deb``): the PGXN zip and Debian packages per PostgreSQL major."""
