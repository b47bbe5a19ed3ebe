# The PGXN distribution's top-level Makefile (`pgxn install` runs `make`, `make install` and
# `make installcheck` here): the extension is the PGXS build in sql/, beside its C core in core/.
PG_CONFIG ?= pg_config

.PHONY: all install installcheck uninstall clean
all install installcheck uninstall clean:
	$(MAKE) -C sql PG_CONFIG=$(PG_CONFIG) $@
