"""The bottom layer: settings, errors, atomic files, names, finite checks, the run-folder lock."""
