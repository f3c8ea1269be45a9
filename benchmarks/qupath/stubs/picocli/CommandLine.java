package picocli;
import java.lang.annotation.*;
/** Stand-in for picocli, only so QuPath's core compiles for reading GeoJSON (never called). */
public class CommandLine {
    public CommandLine(Object o) {}
    public Object parseArgs(String... a) { throw new UnsupportedOperationException(); }
    @Retention(RetentionPolicy.RUNTIME) public @interface Option { String[] names() default {}; String[] description() default {}; }
    @Retention(RetentionPolicy.RUNTIME) public @interface Unmatched {}
}
