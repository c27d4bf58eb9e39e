"""TPU VMs through the TPU API (google-cloud-tpu), and a local emulator of that API."""
