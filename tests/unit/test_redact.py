"""config/redact.py: one redaction for what a run saves, prints and logs: secret-looking names' values and URI
credentials ``***``, values from the environment kept as their interpolations; nothing else changed."""

from omegaconf import OmegaConf

from hydra_raytrain.config.redact import redact_text, redact_tree, redact_yaml, secret_name


def test_secret_looking_names_and_only_those():
    """An environment variable's name with TOKEN, SECRET, PASSWORD, CREDENTIAL or KEY in it; a lower-case setting
    only when its last words say so (not a tokenizer's pad_token, a dataset's image_key)."""
    for name in ("HF_TOKEN", "scaling.worker_env.API_KEY", "AWS_SECRET_ACCESS_KEY", "db_password", "CREDENTIALS"):
        assert secret_name(name), name
    for name in ("api_key", "client_secret", "access_token", "logger.x.password"):
        assert secret_name(name), name
    for name in ("model.key_dim", "monkey", "pad_token", "image_key", "tokenizer", "trainer.monitor", "key"):
        assert not secret_name(name), name


def test_a_command_line_keeps_everything_but_its_secrets():
    typed = (
        "python -m hydra_raytrain 'scaling.worker_env={HF_TOKEN: ${oc.env:T}, API_KEY: abc123}' +x.PASSWORD=pw "
        "storage.path=s3://AK:SK@minio:9000/runs model.key_dim=4 'scaling.worker_env.DB_PASSWORD=\"p w,1\"'"
    )
    assert redact_text(typed) == (
        "python -m hydra_raytrain 'scaling.worker_env={HF_TOKEN: ${oc.env:T}, API_KEY: ***}' +x.PASSWORD=*** "
        "storage.path=s3://***@minio:9000/runs model.key_dim=4 'scaling.worker_env.DB_PASSWORD=***'"
    )


def test_a_config_tree_saves_environment_values_as_interpolations_and_masks_the_rest():
    resolved = {
        "scaling": {"worker_env": {"HF_TOKEN": "hf_real", "API_KEY": "typed", "PIN": 1234, "MODE": "fast"}},
        "logger": {"mlflow": {"tracking_uri": "https://me:pw@mlflow.example.com"}},
        "model": {"key_dim": 4, "layers": [1, 2], "pad_token": "<pad>"},
        "dataset": {"path": "/data/t.parquet"},
    }
    unresolved = {
        "scaling": {"worker_env": {"HF_TOKEN": "${oc.env:HF_TOKEN}", "API_KEY": "typed", "MODE": "${oc.env:M}"}},
        "dataset": {"path": "${oc.env:DATA}/t.parquet"},  # not a secret: saved as resolved, for evaluate
    }
    assert redact_tree(resolved, unresolved) == {
        "scaling": {
            "worker_env": {"HF_TOKEN": "${oc.env:HF_TOKEN}", "API_KEY": "***", "PIN": 1234, "MODE": "${oc.env:M}"}
        },
        "logger": {"mlflow": {"tracking_uri": "https://***@mlflow.example.com"}},
        "model": {"key_dim": 4, "layers": [1, 2], "pad_token": "<pad>"},
        "dataset": {"path": "/data/t.parquet"},
    }
    assert redact_tree({"worker_env": {"DB_PASSWORD": 123456}}) == {"worker_env": {"DB_PASSWORD": "***"}}


def test_hydras_files_are_rewritten_redacted_with_their_interpolations(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "scaling:\n  worker_env:\n    HF_TOKEN: ${oc.env:HF}\n    API_KEY: abc\nrun_dir: ${hydra:run.dir}\n"
    )
    redact_yaml(str(config))
    assert OmegaConf.to_container(OmegaConf.load(config), resolve=False) == {
        "scaling": {"worker_env": {"HF_TOKEN": "${oc.env:HF}", "API_KEY": "***"}},
        "run_dir": "${hydra:run.dir}",
    }
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("- scaling.worker_env.API_KEY=abc\n- model=mlp\n")
    redact_yaml(str(overrides), overrides=True)
    assert OmegaConf.to_container(OmegaConf.load(overrides)) == ["scaling.worker_env.API_KEY=***", "model=mlp"]
    untouched = tmp_path / "plain.yaml"
    untouched.write_text("model: mlp  # a comment stays where nothing is redacted\n")
    redact_yaml(str(untouched))
    assert "a comment stays" in untouched.read_text()
