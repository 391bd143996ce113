"""Names and sizes of the built-in models and datasets, importable without torch (the CLI starts fast)."""

# --model also takes any torchvision classification model by name, or package.module:function.
MODEL_NAMES = ("cnn", "alexnet", "resnet50", "vgg16")
DATASET_NAMES = ("fashion-mnist", "mnist", "synthetic", "imagefolder")
SYNTHETIC_SIZE = 4096  # training samples of --dataset synthetic (a quarter as many test ones)
# text (bno_hvd.data.corpus, bno_hvd.data.tokens) and its language models (bno_hvd.data.gpt)
TEXT_DATASET_NAMES = ("text",)
TEXT_MODEL_NAMES = ("gpt-mini",)
