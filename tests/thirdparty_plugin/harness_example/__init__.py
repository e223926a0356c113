"""An example third-party harness plugin: the ``example`` env family (``ExampleChain-v0``) and
the ``example_reinforce`` algorithm. The entry point is :mod:`harness_example.plugin`."""
