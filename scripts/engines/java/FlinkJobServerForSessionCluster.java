// Beam's Flink job server for a session cluster that already has Beam's classes in its lib/.
//
// Beam's FlinkJobInvoker ships the job server's whole classpath (164 jars, 157 MB) with every
// job: the Flink client uploads them to the JobManager, which stores them as the job's blobs,
// and each TaskManager downloads them and builds a class loader from them for every task. A
// local cluster (beam_pipelines/engines/local_clusters.py) links the same jars into its lib/
// and resolves classes parent-first, so the shipped copies are never used. This invoker is
// Beam's FlinkJobInvoker.invokeWithExecutor (Beam 2.70.0) with no files to stage.
//
// Built by scripts/engines/install.sh against the job server's own jars; run as
//   java -cp <this jar>:<job-server jar> tfrecord.engines.FlinkJobServerForSessionCluster ARGS
// with FlinkJobServerDriver's arguments (--flink-master, --job-port, ...).
package tfrecord.engines;

import java.util.Collections;
import java.util.UUID;
import org.apache.beam.model.pipeline.v1.RunnerApi;
import org.apache.beam.runners.flink.FlinkJobInvoker;
import org.apache.beam.runners.flink.FlinkJobServerDriver;
import org.apache.beam.runners.flink.FlinkPipelineOptions;
import org.apache.beam.runners.flink.FlinkPipelineRunner;
import org.apache.beam.runners.jobsubmission.JobInvocation;
import org.apache.beam.sdk.extensions.gcp.options.GcsOptions;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.Struct;
import org.apache.beam.vendor.guava.v32_1_2_jre.com.google.common.util.concurrent.ListeningExecutorService;

public final class FlinkJobServerForSessionCluster {
  private FlinkJobServerForSessionCluster() {}

  public static void main(String[] args) throws Exception {
    // As FlinkJobServerDriver.main does.
    PipelineOptions options = PipelineOptionsFactory.create();
    options.as(GcsOptions.class).setGcsUploadBufferSizeBytes(1024 * 1024);
    FileSystems.setDefaultPipelineOptions(options);
    FlinkJobServerDriver.FlinkServerConfiguration config = FlinkJobServerDriver.parseArgs(args);
    String master = argument(args, "--flink-master");
    FlinkJobServerDriver.fromConfig(config, () -> new Invoker(config, master)).run();
  }

  private static String argument(String[] args, String name) {
    for (int i = 0; i + 1 < args.length; i++) {
      if (args[i].equals(name)) {
        return args[i + 1];
      }
    }
    throw new IllegalArgumentException("missing " + name);
  }

  /** FlinkJobInvoker, staging no files: the cluster's lib/ has the classes. */
  private static final class Invoker extends FlinkJobInvoker {
    private final String master;

    Invoker(FlinkJobServerDriver.FlinkServerConfiguration config, String master) {
      super(config);
      this.master = master;
    }

    @Override
    protected JobInvocation invokeWithExecutor(
        RunnerApi.Pipeline pipeline,
        Struct options,
        String retrievalToken,
        ListeningExecutorService executorService) {
      FlinkPipelineOptions flinkOptions =
          PipelineOptionsTranslation.fromProto(options).as(FlinkPipelineOptions.class);
      String invocationId = String.format("%s_%s", flinkOptions.getJobName(), UUID.randomUUID());
      if (FlinkPipelineOptions.AUTO.equals(flinkOptions.getFlinkMaster())) {
        flinkOptions.setFlinkMaster(master);
      }
      FlinkPipelineRunner runner =
          new FlinkPipelineRunner(flinkOptions, null, Collections.emptyList());
      flinkOptions.setRunner(null);
      return createJobInvocation(
          invocationId, retrievalToken, executorService, pipeline, flinkOptions, runner);
    }
  }
}
