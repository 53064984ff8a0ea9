"""The evidence behind the default's choices: results that cost hours, made by frozen DVC stages.

    epoch_budget   is recipes.digits.train.epochs converged? (epoch_budget.py)
    replication    the main table's conclusions on disjoint seeds (replication.py)
    regime         the structured init at sharper softness, beside the main grid (regime.py)
    softness_law   the official solver's softness by shape, and its fit (softness_law.py)

What each records beside its results, and when a report may quote it: structinit/records.py.
"""
