"""The console's parts: the top panels and one widget per tab (each a ``TabPane``)."""
