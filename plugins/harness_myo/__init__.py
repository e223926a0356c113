"""MyoSuite's musculoskeletal envs (MuJoCo), the NeurIPS MyoChallenge tasks among them,
gymnasium-native through harness's env contract (``pip install 'harness[myo]'``)."""
