"""``brokerchaos matrix``: configurations x fault classes, each cell an ordinary run per seed.

- ``model``: the matrix file (configurations, fault classes, one workload, seeds), checked field by field;
- ``cells``: each cell expanded into a scenario, whether the configuration can express it, its content key;
- ``records``: one small JSON file per cell and seed, kept in the repository, the page's only input;
- ``execute``: the cells that have no record for their key, run side by side through ``brokerchaos run``;
- ``grading``: each cell's records graded through the ``brokerchaos_grade`` hook (the stored engine);
- ``page``: the graded matrix as a docs page, an HTML table and JSON.
"""
