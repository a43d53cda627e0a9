"""The early pass: a new encoder judged from a chosen part of each dataset before its exact
figures exist (``docs/early.md``)."""
