import Foundation
import ProtectedStoreCore

/// One protocol frame (docs/PROTOCOL.md §2): a JSON message and, when a secret travels, a binary attachment that is
/// decoded straight into guarded memory, so secrets never pass through JSON strings.
package struct Frame {
    /// Largest payload (everything after the 4-byte length) either side accepts.
    package static let maximumPayload = 64 * 1024
    static let lengthBytes = 4
    static let messageLengthBytes = 2

    package var message: [UInt8]
    package var attachment: SecureBytes?

    /// A frame whose bytes break the framing rules; the connection is closed after one error reply.
    struct Malformed: Error, CustomStringConvertible {
        let description: String
    }

    /// Thrown by `encode` for a message that can't fit a frame.
    struct TooLarge: Error {}

    /// Encodes `message` (with `attachment`) into the bytes to send; the caller zeroes them once sent when there is an attachment.
    package static func encode(_ message: some Encodable, attachment: SecureBytes? = nil) throws -> [UInt8] {
        let json = Array(try JSONEncoder().encode(message))
        let attachmentCount = attachment?.count ?? 0
        let payload = messageLengthBytes + json.count + attachmentCount
        guard json.count <= Int(UInt16.max), payload <= maximumPayload else { throw TooLarge() }
        // Reserved exactly, so appending never reallocates and leaves no stray copy of the attachment behind.
        var bytes = [UInt8]()
        bytes.reserveCapacity(lengthBytes + payload)
        bytes.append(contentsOf: bigEndianBytes(UInt32(payload)))
        bytes.append(contentsOf: bigEndianBytes(UInt16(json.count)))
        bytes.append(contentsOf: json)
        if let attachment {
            try attachment.withUnsafeBytes { bytes.append(contentsOf: $0) }
        }
        return bytes
    }

    /// Decodes the frame at the start of `buffer`: nil while it is incomplete, else the frame and the bytes it used.
    /// Throws `Malformed` for a length over the maximum or a message length that does not fit the payload.
    package static func decode(_ buffer: UnsafeRawBufferPointer) throws -> (frame: Frame, consumed: Int)? {
        guard buffer.count >= lengthBytes else { return nil }
        let payload = Int(buffer[0]) << 24 | Int(buffer[1]) << 16 | Int(buffer[2]) << 8 | Int(buffer[3])
        guard payload <= maximumPayload else {
            throw Malformed(description: "frame of \(payload) bytes exceeds the maximum of \(maximumPayload)")
        }
        guard payload >= messageLengthBytes else {
            throw Malformed(description: "frame of \(payload) bytes is too short to hold a message length")
        }
        guard buffer.count >= lengthBytes + payload else { return nil }
        let messageCount = Int(buffer[4]) << 8 | Int(buffer[5])
        guard messageCount <= payload - messageLengthBytes else {
            throw Malformed(description: "message length \(messageCount) exceeds the frame's payload of \(payload) bytes")
        }
        let messageStart = lengthBytes + messageLengthBytes
        let attachmentStart = messageStart + messageCount
        let attachmentCount = lengthBytes + payload - attachmentStart
        let attachment = attachmentCount == 0 ? nil : SecureBytes(count: attachmentCount) { secret in
            secret.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[attachmentStart..<attachmentStart + attachmentCount]))
        }
        return (Frame(message: Array(buffer[messageStart..<attachmentStart]), attachment: attachment), lengthBytes + payload)
    }

    private static func bigEndianBytes<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }
}

/// A byte queue for frames in flight (received and not yet decoded, or encoded and not yet sent). Frames carry
/// passcodes and per-file keys, so unlike an array it never leaves a copy behind: consumed bytes, storage given up
/// when growing, and the whole capacity at the end are zeroed.
package final class FrameBuffer: @unchecked Sendable {
    private var storage: UnsafeMutableRawPointer
    private var capacity: Int
    private var start = 0
    private var end = 0

    package init(capacity: Int = 4096) {
        self.capacity = capacity
        storage = .allocate(byteCount: capacity, alignment: 16)
        storage.initializeMemory(as: UInt8.self, repeating: 0, count: capacity)
    }

    deinit {
        zeroize(storage, count: capacity)
        storage.deallocate()
    }

    /// Bytes queued.
    package var count: Int { end - start }

    package var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: storage + start, count: end - start) }

    package func append(_ chunk: UnsafeRawBufferPointer) {
        guard chunk.count > 0 else { return }
        if capacity - end < chunk.count {
            if capacity - count >= chunk.count && count <= capacity / 2 {
                // Enough room once compacted: move the queued bytes down and zero what they left behind.
                storage.copyMemory(from: storage + start, byteCount: count)
                zeroize(storage + count, count: end - count)
            } else {
                let grown = UnsafeMutableRawPointer.allocate(byteCount: max(capacity * 2, count + chunk.count), alignment: 16)
                grown.copyMemory(from: storage + start, byteCount: count)
                zeroize(storage, count: capacity)
                storage.deallocate()
                storage = grown
                capacity = max(capacity * 2, count + chunk.count)
            }
            end = count
            start = 0
        }
        (storage + end).copyMemory(from: chunk.baseAddress!, byteCount: chunk.count)
        end += chunk.count
    }

    /// Drops the first `n` queued bytes, zeroing them.
    package func consume(_ n: Int) {
        precondition(n <= count)
        zeroize(storage + start, count: n)
        start += n
        if start == end { (start, end) = (0, 0) }
    }

    /// The next complete frame, if one has arrived; throws `Frame.Malformed`.
    package func nextFrame() throws -> Frame? {
        guard let (frame, consumed) = try Frame.decode(bytes) else { return nil }
        consume(consumed)
        return frame
    }

    /// Zeroes and drops everything queued.
    package func wipe() { consume(count) }
}
