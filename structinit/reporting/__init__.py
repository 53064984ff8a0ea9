"""Reports: statistics, tables and figures, and the paper's reference numbers.

    stats.py             paired tests, intervals, conclusions as data
    tables.py            the comparison tables (main, kernel, solve, studies)
    attention_tables.py  the attention report's tables (mass, distance, CKA)
    curves.py            per-epoch curves of a grid's runs
    figures/             every figure in reports/ (matplotlib, Agg)

Nothing here is imported by training: editing a report retrains nothing.
"""
