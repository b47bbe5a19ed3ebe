# dpgd bindings: included from _core.pyx (filled in by its owner).
