"""The EAGLE-3 draft: its definition (model.py), vocabulary map (vocab.py), training and export."""
