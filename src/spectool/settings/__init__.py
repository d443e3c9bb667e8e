"""Settings groups cut by concern: pure data, torch-free, one docstring per field and one `validate(spell)` whose
errors name the caller's spelling of each field (a flag, an rl.yaml key, a keyword argument: spelling.py).

Every entry point composes the same groups, so a setting is one field in one file: the commands' settings
(config/, harvesting.HarvestConfig) inherit them and the command line is generated from their fields (cli.py);
rl.yaml's sections are them (rl/config.py); SpectoolSpeculation inherits them (integrations/trl). Behaviour that
reads the settings (resolving a draft, a sweep's schedule, the refresh policy) lives in the library, not here.
"""
