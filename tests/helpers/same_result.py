"""The config whose result must not depend on the worker count, accumulation or the day (test_training_features)
and which FSDP must reproduce (test_fsdp)."""

# An MLP without batch norm or dropout, SGD with momentum, clipping, a warm-up and a cosine schedule, random crops
# and flips on the workers. 29 full global batches of 48 per epoch (1,437 training images: the 30th would be
# partial, and padded differently for different worker counts). The digits are in memory: they take the
# device-resident path, unless trainer.data_on_device=false.
SAME_RESULT = [
    "model=mlp",
    "optimizer=sgd",
    "scheduler=cosine",
    "scheduler.warmup_steps=10",
    "trainer.gradient_clip_val=1.0",
    "trainer.max_epochs=2",
    "trainer.seed=3",
    "trainer.augment.random_crop_padding=1",
    "trainer.augment.horizontal_flip=true",
]
GLOBAL_48 = ["trainer.batch_size=48", "trainer.limit_train_batches=29"]
