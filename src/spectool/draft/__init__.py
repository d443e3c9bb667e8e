"""The drafts: definitions (model.py: EAGLE-3 and P-EAGLE; dflash.py; mtp.py), vocabulary map (vocab.py), training
and export. What each family is lives a floor below, in spectool/families.py."""
