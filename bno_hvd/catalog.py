"""Names of the models and datasets, importable without torch (the CLI starts fast)."""

MODEL_NAMES = ("cnn", "alexnet", "resnet50", "vgg16")
DATASET_NAMES = ("fashion-mnist", "mnist", "synthetic")
