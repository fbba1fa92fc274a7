# A package, so that test modules of the same name in two folders do not clash.
