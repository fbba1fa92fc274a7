# A package, so that test modules of the same name in two folders do not clash. Not named
# "packaging": tests/ is on sys.path, and that would hide the `packaging` library.
