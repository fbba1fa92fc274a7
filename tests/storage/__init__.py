# A package, so that this directory's conftest.py is imported as storage.conftest and does not
# replace tests/conftest.py as the module "conftest" that other tests import from.
