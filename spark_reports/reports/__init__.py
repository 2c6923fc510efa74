"""The reports: the run's HTML page, its sections, and the grade's page."""
