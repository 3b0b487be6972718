"""The commands: `klguard train | eval | export | sft | demo | calibrate | report`, thin layers over the engine."""
