"""The report's sections, one module per topic; each returns a Section that says whether it has content."""
