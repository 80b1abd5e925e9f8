"""Counts its requests with Triton's custom metrics API.

Each request's X is observed into a histogram, its requests are counted (and the count, which
both instances share, is the answer), the time `execute` took is added to a counter as in
Triton's own example, and the last batch's size is a gauge. X = -1 tries to count backwards
and X = -2 declares a family again as another kind: both raise, failing that request."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.latency = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric(labels=labels)
        self.requests = pb_utils.MetricFamily(
            "metered_requests", "Requests the model answered", pb_utils.MetricFamily.COUNTER
        ).Metric(labels={"model": args["model_name"]})
        self.batch = pb_utils.MetricFamily(
            "metered_batch_size", "Requests in the last batch", pb_utils.MetricFamily.GAUGE
        ).Metric()
        self.values = pb_utils.MetricFamily(
            "metered_value", "The X of each request", pb_utils.MetricFamily.HISTOGRAM
        ).Metric(labels={"model": args["model_name"]}, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        start = time.perf_counter_ns()
        self.batch.set(len(requests))
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0])
            try:
                if x == -1:
                    self.requests.increment(-1)
                elif x == -2:
                    pb_utils.MetricFamily("metered_requests", "again", pb_utils.MetricFamily.GAUGE)
                self.values.observe(x)
                self.requests.increment(1)
                count = self.requests.value()
            except pb_utils.TritonModelException as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(e.message())))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("COUNT", np.array([[count]], np.float64)),
                pb_utils.Tensor("PID", np.array([[os.getpid()]], np.int64)),
            ]))
        self.latency.increment(time.perf_counter_ns() - start)
        return responses
