// Interop probe for tests/integration/test_mm2_interop.py: MirrorMaker 2's own classes read and write
// the records mirrorflow encodes. It lives in MM2's package only to reach the package-private
// serializers (recordKey / recordValue), so the test can compare bytes with MM2's own encoder.
//
// Reads commands from stdin, one per line, fields separated by tabs; answers each with lines that
// start with ">>" (anything else on stdout is logging), the last one being ">>END".
//   decode-checkpoint / decode-heartbeat / decode-offsetsync  <keyhex> <valuehex>
//   encode-checkpoint <group> <topic> <partition> <upstream> <downstream> <metadata>
//   encode-heartbeat  <source> <target> <timestamp>
//   encode-offsetsync <topic> <partition> <upstream> <downstream>
//   translate <bootstrap> <sourceAlias> <group> <timeoutMs>   (RemoteClusterUtils.translateOffsets)
package org.apache.kafka.connect.mirror;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.TreeMap;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;

public final class Mm2Probe {
    private static final HexFormat HEX = HexFormat.of();

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) {
                continue;
            }
            String[] f = line.split("\t", -1);
            try {
                run(f, out);
            } catch (Exception e) {
                out.println(">>ERROR\t" + e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            out.println(">>END");
        }
    }

    private static ConsumerRecord<byte[], byte[]> record(String keyHex, String valueHex) {
        return new ConsumerRecord<>("probe", 0, 0L, HEX.parseHex(keyHex), HEX.parseHex(valueHex));
    }

    private static void run(String[] f, PrintStream out) throws Exception {
        switch (f[0]) {
            case "decode-checkpoint" -> {
                Checkpoint c = Checkpoint.deserializeRecord(record(f[1], f[2]));
                out.println(">>" + String.join("\t", c.consumerGroupId(), c.topicPartition().topic(),
                        Integer.toString(c.topicPartition().partition()), Long.toString(c.upstreamOffset()),
                        Long.toString(c.downstreamOffset()), c.metadata()));
            }
            case "decode-heartbeat" -> {
                Heartbeat h = Heartbeat.deserializeRecord(record(f[1], f[2]));
                out.println(">>" + String.join("\t", h.sourceClusterAlias(), h.targetClusterAlias(),
                        Long.toString(h.timestamp())));
            }
            case "decode-offsetsync" -> {
                OffsetSync s = OffsetSync.deserializeRecord(record(f[1], f[2]));
                out.println(">>" + String.join("\t", s.topicPartition().topic(),
                        Integer.toString(s.topicPartition().partition()), Long.toString(s.upstreamOffset()),
                        Long.toString(s.downstreamOffset())));
            }
            case "encode-checkpoint" -> {
                Checkpoint c = new Checkpoint(f[1], new TopicPartition(f[2], Integer.parseInt(f[3])),
                        Long.parseLong(f[4]), Long.parseLong(f[5]), f[6]);
                out.println(">>" + HEX.formatHex(c.recordKey()) + "\t" + HEX.formatHex(c.recordValue()));
            }
            case "encode-heartbeat" -> {
                Heartbeat h = new Heartbeat(f[1], f[2], Long.parseLong(f[3]));
                out.println(">>" + HEX.formatHex(h.recordKey()) + "\t" + HEX.formatHex(h.recordValue()));
            }
            case "encode-offsetsync" -> {
                OffsetSync s = new OffsetSync(new TopicPartition(f[1], Integer.parseInt(f[2])),
                        Long.parseLong(f[3]), Long.parseLong(f[4]));
                out.println(">>" + HEX.formatHex(s.recordKey()) + "\t" + HEX.formatHex(s.recordValue()));
            }
            case "translate" -> {
                Map<String, Object> props = new HashMap<>();
                props.put("bootstrap.servers", f[1]);
                Map<TopicPartition, OffsetAndMetadata> offsets = RemoteClusterUtils.translateOffsets(
                        props, f[2], f[3], Duration.ofMillis(Long.parseLong(f[4])));
                Map<String, String> sorted = new TreeMap<>();
                offsets.forEach((tp, om) -> sorted.put(tp.topic() + "\t" + tp.partition(),
                        om.offset() + "\t" + om.metadata()));
                sorted.forEach((tp, om) -> out.println(">>" + tp + "\t" + om));
            }
            default -> throw new IllegalArgumentException("unknown command " + f[0]);
        }
    }
}
