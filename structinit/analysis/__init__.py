"""What a trained (or just initialized) model computes.

    attention.py   attention maps and the mass on each head's target offset
    cka.py         linear CKA between layer representations
    model.py       one model's attention and representations (ModelAnalysis)
"""
