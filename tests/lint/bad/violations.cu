// Fixture for tests/lint/stream_order.cmake (never compiled): every line below but the last two is a violation.
void f(float* d, const float* h, int n, cudaStream_t s) {
  cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(d, 0, n * sizeof(float));
  kernel<<<dim3(n, 1), 256>>>(d);
  kernel<<<n, 256, 0>>>(d);
  cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, 0);
  cudaMemsetAsync(d, 0, n, cudaStreamLegacy);
  kernel<<<dim3(n, 1), 256, 0, s>>>(d);
  cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, s);
}
