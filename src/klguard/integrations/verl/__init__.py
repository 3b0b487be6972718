"""klguard inside verl 0.9.1 (`pip install -e '.[verl]'` in klguard's clone): trainer mode `klguard`.

    python -m verl.trainer.main_ppo ... trainer.v1.trainer_mode=klguard +klguard.guard.kl_hard_limit=0.8

`import verl` loads the `verl.plugins` entry point `klguard` (klguard.integrations.verl.plugin), which registers
`KLGuardTrainer`, verl's synchronous PPO trainer with klguard's guard after each step. `host` holds what each of
the guard's decisions does to verl's trainer, apart from verl's worker groups. Importing this
package imports no verl.
"""
