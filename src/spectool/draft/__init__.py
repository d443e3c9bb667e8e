"""The drafts: families (families.py), definitions (model.py: EAGLE-3 and P-EAGLE; dflash.py; mtp.py), vocabulary map
(vocab.py), training and export."""
