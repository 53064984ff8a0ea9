"""Figures for reports/ (matplotlib, Agg): one module per figure family.

    style.py       shared look: one colour per initializer, deterministic PNG bytes
    curves.py      accuracy and loss per epoch, mean with a band over seeds
    attention.py   attention maps, impulse kernels, mean attention distance
    cka.py         CKA heat maps
    data_size.py   accuracy against training-set size
"""
