"""The built-in reward-hacking task: arithmetic data, a character tokenizer and tiny Llama, the SFT policy that
ships in the package, the length-biased proxy and the learned reward model, the demo's KL recipes, and the task as
a TRL user meets it (`klguard.builtin.trl_task`).

It sits above the engine (klguard.ppo), which never imports it: `klguard.builtin.task.TASK` is the engine's
`BuiltinTask`, passed in by the commands.
"""
