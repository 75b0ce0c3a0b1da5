"""``python -m hydra_raytrain.predict``: the command's address. Its code is ``hydra_raytrain.inference.predict``,
in the wing of the package that reads finished runs."""

from hydra_raytrain.inference.predict import main

if __name__ == "__main__":
    main()
