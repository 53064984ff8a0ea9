"""Reports: statistics, tables and figures, and the paper's reference numbers.

    paper.py             the paper's reference: recipes, model shapes, published numbers
    presentation.py      how each initializer is shown (label, colour)
    stats.py             tests, intervals, conclusions as data
    tables.py            the comparison tables (main, kernel, solve, studies), "What ran"
    main_report.py       main_table.md, kernel_table.md, preopt_table.md, summary.json, cells.csv
    study_reports.py     one report per study (STUDY_REPORTS)
    attention_report.py  attention.md and its figures
    attention_tables.py  the attention report's tables (mass, distance, CKA)
    curves.py            per-epoch curves of a grid's runs
    index.py             reports/README.md, the index of every report
    runs.py              reading a trained cell's results
    figures/             every figure in reports/ (matplotlib, Agg)

Nothing here is imported by training: editing a report retrains nothing.
"""
