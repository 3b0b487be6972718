"""klguard: a PPO trainer for RLHF whose KL control is calibrated to stop reward hacking."""

__version__ = "0.1.0"
