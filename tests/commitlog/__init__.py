# A package, so that test modules of the same name in two folders do not clash, and this folder's
# conftest.py is imported as commitlog.conftest instead of replacing tests/conftest.py as the
# module "conftest" that other tests import from.
